"""3D assets as a feature source: meshes decoded and measured (`mesh_features`), a Ray Data pipeline that derives
their features incrementally (`pipeline`), the record of what was derived (`state`) and batch generation of new
assets through the Cube 3D engine (`generation`)."""
