"""3D assets as a feature source: meshes decoded and measured (`mesh_features`, one batch at a time in `derive`),
the assets that changed since the last run (`inventory`, against the record in `state`), the Ray Data pipeline
that derives them (`pipeline`) and writes the history and offline tables (`offline`), and batch generation of new
assets through the Cube 3D engine (`generation`)."""
