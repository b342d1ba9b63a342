"""The top floor: the `embedder` command line, whose subcommands wire the packages below together."""
