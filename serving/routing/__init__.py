"""`featurectl gateway`: one HTTP API in front of several `featurectl generate-server` replicas.

`upstream` keeps pooled keep-alive connections to each replica, `replica` holds what the gateway measured of one
(latency estimate, requests in flight, ejection), `balancer` picks a replica per request (power of two choices on
latency x queue depth, or round robin), `app` answers the clients (keys and budgets once, retries, job ids that
route back to their replica) and `metrics` exposes it all per replica.
"""
