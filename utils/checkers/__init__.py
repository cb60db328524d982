"""The labs' checkers, one module per lab, named like its reference solution in ``labs/solutions/``.

- ``common``: how every lab grades an answer: ``LabCheckFailed`` (a named mistake and its hint),
  ``CheckResult``, ``fail``, the answer run on ranks with its errors brought back, one set of tolerances.
- ``feedback``: how a rejected answer shows in a notebook: a panel (the mistake's name, the evidence, the hint,
  what to try next) instead of a traceback through checker code (``LabCheckFailed._render_traceback_``).
- ``harness``: every call into learner code, in the kernel (``learner_call``) and in the ranks (``caught``): what
  the answer raises is the mistake ``raised``, with the answer's own line.
- ``teacher_side``: a checker's teacher's side, a module of ``labs/solutions/`` loaded by path where the course
  holds it (lab 09's search, labs 01a and 01b's plans); None in the student release and the grader's sandbox.
- ``answer_side``: where the learner's code runs when the workshop's grader holds it by name (``AnswerRef``): in
  the ranks, and in one sandboxed answer process for the steps marked ``@answer_side``, never in the judge.
- ``rank_secrets``: inputs only one rank holds (``new_seeds``, ``generator``, ``rank_args``: a seed each, on a pipe
  of its own) and the check of what the ranks report (``reports``, ``report_each``, ``fields``, ``tensors_like``):
  observations only; the checker computes the expected result outside the ranks, so an answer that replaces a
  checker's rank function still has to move the data.
- ``watch``: the watcher of forbidden calls (``watched_call``, ``Watcher``), on every thread, refusing an answer
  that switches it off (``tampered``); ``guard``: the key targets tripped in place while the answer runs
  (``Guard``), so that no alias, ``partial``, thread or pool task reaches them unseen.
- ``rank_secrets``: inputs only one rank holds (a seed each, through ``run_ranks``' ``rank_args``), so that a checker
  computes its references outside the ranks and takes a rank's report as observations, of a shape it checks.
- ``boundaries``: the hard cases every checker tries, from one place (world sizes with a non-power-of-two above
  4, element counts, bucket caps filled exactly or missed by one, logits far apart), each with its kind.
- ``halving_doubling``: what labs 01a and 01b share (the peer log, the cases, the pattern check, ``virtual_ranks``);
  ``halving_doubling_tables``: the plans their messages are judged by, stored as numbers (issue 37).
- ``halving_reduce_scatter``: lab 01a, ``check_halving_reduce_scatter``.
- ``doubling_all_gather``: lab 01b, ``check_doubling_all_gather``.
- ``folded_all_reduce``: lab 01b, ``check_halving_doubling_all_reduce``.
- ``ddp``: lab 02, ``check_ddp`` (a ``BucketedDDP``).
- ``zero``: lab 03, ``check_make_buckets``, ``check_bucketed_zero2``; its pieces ``zero_buckets`` (the bucket rule),
  ``zero_optim`` (the inner optimizer and its groups), ``zero_memory`` (every live tensor an answer keeps) and
  ``zero_reference`` (each rank's own model seed and batches, and plain DDP on them, computed outside the ranks).
- ``tensor_parallel``: lab 05, ``check_vocab_parallel_cross_entropy``.
- ``pipeline_schedule``: lab 06, ``check_interleaved``.
- ``plan_3d``: lab 09, ``check_choose_plan``, ``check_plan_run``.
- ``hang_debugging``: labs 11a and 11b, ``check_diagnosis``, ``check_fix``.
- ``ring_attention``: lab 14, ``check_block_backward``, ``check_ring_attention``.
- ``labs``: every lab in one table (``LABS``): its notebook, the names a learner writes, the checks that
  grade them; ``answers_from_notebook`` runs only a lab notebook's definitions, ``defined_names`` reads them
  without running anything.
"""
