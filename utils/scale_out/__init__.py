"""Beyond one notebook (lessons 10 and 11): ``torchrun`` (what a lesson script does under ``torchrun``: join the
process group, print its ``RESULT`` line, leave; the notebook's side of the launch is ``utils.launch.scripts``),
``resume`` (a run that checkpoints what it needs with DCP and resumes bit for bit).
"""
