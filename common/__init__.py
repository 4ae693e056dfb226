"""Plumbing every part shares, below all of them: the project's settings (`config`), the Flink environment and
jar locations (`flink`), the one exception root (`errors`) and how instants are read (`instants`). It imports no
other package of ours, so the DSL, the runtimes, serving, inference and the CLI can all import it."""
