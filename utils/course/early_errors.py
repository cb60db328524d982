"""Run the first code cells of many notebooks in ONE Python, each in a fresh IPython namespace, and report the
first error each raises: what ``test_unsupported_world_size_fails_early`` needs, without a kernel and papermill
per notebook (each costs ~10 s of start-up and imports; here torch is imported once for all of them).

    python -m utils.course.early_errors CELLS JSON_IN JSON_OUT

JSON_IN: [[notebook path, {parameter: value}], ...]. For each notebook, its code cells run in order, papermill's
way: the cell tagged ``parameters``, then the given values as a cell of assignments, then the rest; it stops at the
first error or after CELLS code cells of the notebook. JSON_OUT: {path: {"error": "ValueError" or null,
"message": ..., "cells": code cells run, the failing one included}}.
"""

import json
import os
import sys


def run(path, parameters, max_cells, shell):
    nb = json.load(open(path))
    shell.reset(new_session=False)
    os.chdir(os.path.dirname(os.path.abspath(path)))  # papermill's --cwd: the notebook's folder
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    ran = 0
    for cell in cells:
        if ran >= max_cells:
            break
        source = "".join(cell["source"])
        ran += 1
        result = shell.run_cell(source, store_history=False, silent=True)
        if result.error_before_exec or result.error_in_exec:
            err = result.error_in_exec or result.error_before_exec
            return {"error": type(err).__name__, "message": str(err), "cells": ran}
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            injected = "\n".join(f"{k} = {v!r}" for k, v in parameters.items())
            result = shell.run_cell(injected, store_history=False, silent=True)
            if not result.success:
                return {"error": "InjectionFailed", "message": injected, "cells": ran}
    return {"error": None, "message": "", "cells": ran}


def main(max_cells, json_in, json_out):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    here = os.getcwd()
    out = {}
    for path, parameters in json.load(open(json_in)):
        try:
            out[path] = run(path, parameters, int(max_cells), shell)
        finally:
            os.chdir(here)
    json.dump(out, open(json_out, "w"))


if __name__ == "__main__":
    main(*sys.argv[1:])
