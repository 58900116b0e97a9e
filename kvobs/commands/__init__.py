"""One module per `kvobs` command: `add_parser(subparsers)` defines its flags, `run(args)` does the work.

`run` imports what it needs inside the function, so building the parser never imports torch and a
collector-only install can run the commands it has.
"""
