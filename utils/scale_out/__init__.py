"""Beyond one notebook (lessons 10 and 11): ``torchrun`` (a lesson script under ``torchrun`` from a notebook,
one agent or two as two nodes, killed as a whole on a timeout), ``resume`` (a run that checkpoints what it
needs with DCP and resumes bit for bit).
"""
