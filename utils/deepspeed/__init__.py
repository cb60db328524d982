"""DeepSpeed (lessons 07a, 07b and 07c): ``cpu`` (DeepSpeed set up in one call with no C++ op compiled), ``schema``
(what the installed DeepSpeed accepts in its config, learned from DeepSpeed), ``config`` (``check_config``:
every problem of a config at every level), ``training`` (what lesson 07's launches share), ``partitions``
(what the ZeRO optimizer holds on one rank, read from its partitions). Inside, ``import deepspeed`` is
the library (absolute imports).
"""
