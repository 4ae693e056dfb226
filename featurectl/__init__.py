"""featurectl: the command-line front end of the feature platform (imported by nobody else)."""
