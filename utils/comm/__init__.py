"""Collectives and what they send (lesson 01 on): ``ledger`` (``CommLedger``: bytes and time of every collective
a rank calls), ``p2p`` (``sendrecv``: point to point without deadlock, notebook 01a), ``compat`` (the collectives
whose names or gloo support changed between torch 2.11 and 2.13), ``subgroup`` (``chunk_bounds``, and
``reduce_scatter_chunks``: torch's reduce-scatter run by some of the ranks, the half lab 01b is given),
``process_group_calls`` (``observe``: every call that reaches a process group, however the caller named the
function: where the ledger and lab 01's peer log count what steps around ``torch.distributed``'s names).
"""
