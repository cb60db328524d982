"""Running the course as a workshop: tools for the teacher.

- ``grade``: every learner's lab notebooks through the labs' checkers, each answer in its own process
  (``make grade SUBMISSIONS=folder``); ``gradebook`` writes what it decided.
"""
