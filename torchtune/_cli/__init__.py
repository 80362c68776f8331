"""The ``tune`` command line: one module per subcommand, each exposing ``add_parser(subparsers)``."""
