"""Collectives and what they send (lesson 01 on): ``ledger`` (``CommLedger``: bytes and time of every collective
a rank calls), ``p2p`` (``sendrecv``: point to point without deadlock, notebook 01a), ``compat`` (the collectives
whose names or gloo support changed between torch 2.11 and 2.13).
"""
