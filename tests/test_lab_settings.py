"""`make lab` opens the course with no first-run prompt: the course's JupyterLab overrides are valid and in place.

utils/course/lab_overrides.json holds them; `make setup` installs them into .venv's app settings
(overrides.d), which jupyterlab_server reads as the defaults of every user's settings (`_get_overrides`).
"""

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from jsonschema import Draft7Validator

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ROOT / "utils" / "course" / "lab_overrides.json"
SCHEMAS = Path(sys.prefix) / "share" / "jupyter" / "lab" / "schemas"
QUIET = {("@jupyterlab/apputils-extension:notification", "fetchNews"): "false",  # "none" asks "Jupyter news?"
         ("@jupyterlab/notebook-extension:tracker", "autoStartDefaultKernel"): True}  # no kernel chooser


def overrides():
    return json.loads(SETTINGS.read_text())


def test_each_override_is_a_valid_setting_of_an_installed_plugin():
    for plugin, values in overrides().items():
        package, name = plugin.split(":")
        schema = SCHEMAS / package / f"{name}.json"
        assert schema.is_file(), f"{plugin}: no schema {schema}; a plugin renamed in this JupyterLab?"
        properties = json.loads(schema.read_text())["properties"]
        for key, value in values.items():
            assert key in properties, f"{plugin} has no setting {key!r}; it has {sorted(properties)}"
            errors = [e.message for e in Draft7Validator(properties[key]).iter_errors(value)]
            assert not errors, f"{plugin} {key} = {value!r}: {errors}"


def test_the_prompts_are_off():
    for (plugin, key), value in QUIET.items():
        assert overrides()[plugin][key] == value, (plugin, key)


def test_setup_installed_them_where_jupyterlab_reads_them():
    from jupyterlab.commands import get_app_dir
    from jupyterlab_server.settings_utils import _get_overrides

    found, error = _get_overrides(os.path.join(get_app_dir(), "settings"))  # what LabApp passes (its app_settings_dir)
    assert not error, error
    for (plugin, key), value in QUIET.items():
        assert found.get(plugin, {}).get(key) == value, (f"{plugin} {key} is {found.get(plugin, {}).get(key)!r} in "
                                                         f"JupyterLab's overrides, not {value!r}: run `make setup`")
    # the file the Makefile copies, byte for byte: a stale copy (or a setup that no longer copies it) fails here
    installed = Path(get_app_dir()) / "settings" / "overrides.d" / "distributed-course.json"
    assert installed.is_file() and installed.read_bytes() == SETTINGS.read_bytes(), (
        f"{installed} is not a copy of {SETTINGS.relative_to(ROOT)}: run `make setup` (its cp line installs it)")


@pytest.mark.slow
def test_make_lab_serves_them_as_the_defaults(tmp_path):
    """`make lab` itself, with empty user settings (a learner's first run): the settings API answers the overrides."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"))
    args = f"--no-browser --port={port} --ServerApp.port_retries=0 --IdentityProvider.token={token}"
    log = (tmp_path / "lab.log").open("w+")
    server = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_ARGS={args}"], cwd=ROOT, env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        for (plugin, key), value in QUIET.items():
            while True:
                try:
                    url = f"http://127.0.0.1:{port}/lab/api/settings/{plugin}?token={token}"
                    with urllib.request.urlopen(url, timeout=5) as answer:
                        answered = json.loads(answer.read())
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        pytest.fail(f"`make lab` did not serve port {port} within 120 s:\n{log.read()[-3000:]}")
                    time.sleep(1)
            # the schema's default is what the page uses when the learner has set nothing (here: no user settings)
            assert answered["schema"]["properties"][key]["default"] == value, (plugin, key, answered["schema"])
            assert key not in answered["settings"], answered["settings"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # make and jupyter lab: the group we started
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
