"""One module per command of ``flopscope``.

In the order ``flopscope --help`` lists them: ``peak``, ``demo``, ``profile``, ``diff``,
``compare``, ``crosscheck``, ``generate``. Each module's ``register(commands)`` adds the
command's parser and its options; its ``run(args)`` does the work and returns the exit
code. ``profile`` hands a
``diffusers:`` target to ``pipeline`` and ``--tp`` / ``--dp`` to ``sharded``; each of
those declares its own options with ``add_options(parser)``.
"""
