"""Collectives and what they send (lesson 01 on): ``ledger`` (``CommLedger``: bytes and time of every collective
a rank calls), ``p2p`` (``sendrecv``: point to point without deadlock, notebook 01a), ``compat`` (the collectives
whose names or gloo support changed between torch 2.11 and 2.13), ``subgroup`` (``chunk_bounds``, and
``reduce_scatter_chunks``: torch's reduce-scatter run by some of the ranks, the half lab 01b is given).
"""
