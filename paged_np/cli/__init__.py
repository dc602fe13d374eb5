"""The command line, ``python -m paged_np COMMAND``: one module per subcommand.

Nothing outside this folder imports from it; each module's ``main(argv)`` is
looked up by :mod:`paged_np.__main__` only when its command is asked for.
"""
