"""Serve the course to N learners from one machine: a JupyterHub, ``make hub USERS=N``.

What runs (all from the course's .venv, with the ``teacher`` extra that ``make hub`` installs):

- **JupyterHub** logs learners in and starts one Jupyter server per learner;
- its **proxy**, ``configurable-http-proxy``: the Python implementation from PyPI (the same command
  name and flags as the npm one, so no Node.js is needed), which routes ``/user/<name>/`` to that
  learner's server;
- a **local spawner** (JupyterHub's ``SimpleLocalProcessSpawner``): each learner's server is a process
  of this machine's user, in its own home folder (``build/hub/home/<name>``) holding its own copy of
  the notebooks and labs, with its own temporary folder, its CPU slice pinned and its GPUs dealt
  (``seats.py``);
- **the student release, not the teacher's checkout** (``make student``'s ``build/student/release``): the
  learners' copies of the notebooks and labs come from it and their kernels import its ``utils``; each server
  runs in the sandbox of ``sandbox.py`` (bubblewrap), which sees the release and the Python environment
  read-only, its own home read-write and nothing else of the machine's course folder: no ``labs/solutions``,
  instructor keys, teacher's notes, gradebook or other learner. Where bubblewrap cannot run, the hub refuses to
  start unless told ``--no-sandbox`` (then a learner's code can read the checkout by its path);
- JupyterHub's **shared-password authenticator**: the listed learners, one password for all of them
  (``HUB_PASSWORD``, 8 characters or more). Fine for a room on a private network for a day; on a machine
  others can reach, use a real one (PAM, OAuth). Without a password (the test) it is the **dummy**
  authenticator, which lets the listed learners in with any password.

``python -m utils.workshop.hub --users 4`` writes ``build/hub/jupyterhub_config.py`` and runs the hub
in the foreground (Ctrl-C stops it, and the learners' servers with it). tests/test_workshop_hub.py
starts it with four learners and runs a 2-rank all-reduce in each learner's kernel at once.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

from jupyterhub.spawner import SimpleLocalProcessSpawner
from traitlets import Bool, Dict, Unicode

from .seats import Seat, deal_seats

ROOT = Path(__file__).resolve().parents[2]  # the course: holds utils/, notebooks/, labs/
BIN = Path(sys.executable).parent  # .venv/bin: jupyterhub-singleuser and configurable-http-proxy
RELEASE = ROOT / "build" / "student" / "release"  # make student: the course without answers, keys or notes
COURSE_FOLDERS = ("notebooks", "labs", "data")  # copied into each learner's home
NOT_FOR_LEARNERS = ("solutions", "__pycache__", ".ipynb_checkpoints")
API_TOKEN_VARIABLE = "COURSE_HUB_API_TOKEN"  # a token for a service with admin rights (the test uses it)


class CourseSpawner(SimpleLocalProcessSpawner):
    """JupyterHub's simple local spawner, plus the learner's seat: CPU affinity, GPUs, a temp folder."""

    seats = Dict(config=True, help="learner name -> Seat fields (seats.deal_seats), set by configure()")
    course = Unicode(str(RELEASE), config=True, help="the course the learners get: the student release")
    sandboxed = Bool(True, config=True, help="run each learner's server in utils.workshop.sandbox")

    def seat(self) -> Seat:
        return Seat(**self.seats[self.user.name])

    def make_preexec_fn(self, name):
        """Runs in the learner's server process before it executes: pin it to its cores (its kernels
        and their ranks inherit the pinning), then JupyterHub's own step (make the home, go there)."""
        cores = set(self.seat().cores)
        theirs = super().make_preexec_fn(name)

        def preexec():
            if hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, cores)
            theirs()
        return preexec

    def get_env(self):
        env = super().get_env()
        home = Path(self.home_dir)
        env.update(self.seat().environment())
        env["TMPDIR"] = str(home / ".tmp")  # run_ranks' rendezvous folders: each learner's own
        env["JUPYTER_PATH"] = str(BIN.parent / "share" / "jupyter")  # the course's kernel first, as `make lab` does
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', os.defpath)}"
        env["PYTHONPATH"] = self.course  # the release's utils, ahead of the checkout's editable install
        return env

    async def start(self):
        home = Path(self.home_dir)
        copy_course(home, Path(self.course))
        if self.sandboxed:
            from .sandbox import sandboxed

            self._scratch = tempfile.mkdtemp(prefix=".sandbox-", dir=home.parent)  # removed by stop
            self.cmd = sandboxed([str(BIN / "jupyterhub-singleuser")], home, readable=[self.course], net=True,
                                 devices=sorted(Path("/dev").glob("nvidia*")), scratch=self._scratch)
        return await super().start()

    async def stop(self, now=False):
        try:
            return await super().stop(now=now)
        finally:
            scratch, self._scratch = getattr(self, "_scratch", None), None
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)


def copy_course(home: Path, course: Path = RELEASE):
    """The learner's own copy of the course (``course``: the student release), made once: a restart keeps
    their edits. ``utils`` is not copied: the kernel imports the release's."""
    home.mkdir(parents=True, exist_ok=True)
    (home / ".tmp").mkdir(exist_ok=True)
    for folder in COURSE_FOLDERS:
        if (course / folder).is_dir() and not (home / folder).exists():
            shutil.copytree(course / folder, home / folder, ignore=shutil.ignore_patterns(*NOT_FOR_LEARNERS))


def configure(c, users, state_dir, port=8000, ip="127.0.0.1", hub_port=8081, proxy_api_port=8001,
              password=None, api_token=None, cores=None, gpus=None, course=str(RELEASE), sandboxed=True):
    """Fill JupyterHub's config object ``c`` (what ``jupyterhub_config.py`` receives) for a workshop: the learners
    get ``course`` (the student release), each server in the sandbox unless ``sandboxed`` is False."""
    if not (Path(course) / "utils").is_dir() or (Path(course) / "labs" / "solutions").exists():
        raise ValueError(f"{course} is not a student release (no utils/, or labs/solutions/ in it): run "
                         "`make student` and serve build/student/release")
    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    seats = deal_seats(users, cores, gpus)
    c.JupyterHub.ip, c.JupyterHub.port = ip, port
    c.JupyterHub.hub_ip, c.JupyterHub.hub_port = "127.0.0.1", hub_port
    c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
    c.JupyterHub.cleanup_servers = True  # Ctrl-C on the hub stops every learner's server
    c.ConfigurableHTTPProxy.command = [str(BIN / "configurable-http-proxy")]
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{proxy_api_port}"
    c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")
    if password:
        if len(password) < 8:
            raise ValueError(f"HUB_PASSWORD has {len(password)} characters; JupyterHub's shared-password "
                             f"authenticator needs 8 or more: choose a longer one.")
        c.JupyterHub.authenticator_class = "shared-password"
        c.SharedPasswordAuthenticator.user_password = password
    else:
        c.JupyterHub.authenticator_class = "dummy"  # any password: only for a hub nobody else can reach
    c.Authenticator.allowed_users = set(users)
    c.JupyterHub.spawner_class = CourseSpawner
    c.CourseSpawner.seats = {s.learner: vars(s) for s in seats}
    c.CourseSpawner.course, c.CourseSpawner.sandboxed = str(Path(course).resolve()), sandboxed
    c.CourseSpawner.home_dir_template = str(state / "home" / "{username}")
    c.Spawner.cmd = [str(BIN / "jupyterhub-singleuser")]
    c.Spawner.args = ["--allow-root"] if hasattr(os, "getuid") and os.getuid() == 0 else []
    c.Spawner.default_url = "/lab/tree/notebooks/00_start_here.ipynb"
    c.Spawner.start_timeout = c.Spawner.http_timeout = 180  # a loaded 2-core box takes a while to import
    if api_token:  # a service that may start, use and stop every learner's server: the test drives the hub with it
        c.JupyterHub.services = [{"name": "course-check", "api_token": api_token}]
        c.JupyterHub.load_roles = [{"name": "course-check", "services": ["course-check"],
                                    "scopes": ["admin:users", "admin:servers", "access:servers", "read:users"]}]
    return seats


def write_config(state_dir, **settings) -> Path:
    """``jupyterhub_config.py`` in ``state_dir``: two lines calling ``configure`` with these settings."""
    path = Path(state_dir) / "jupyterhub_config.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Written by utils/workshop/hub.py (make hub); edit that, not this.\n"
                    "import os\nfrom utils.workshop.hub import configure\n"
                    f"configure(c, state_dir={str(Path(state_dir).resolve())!r}, "
                    f"api_token=os.environ.get({API_TOKEN_VARIABLE!r}), password=os.environ.get('HUB_PASSWORD'), "
                    + ", ".join(f"{k}={v!r}" for k, v in settings.items()) + ")\n")
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description="Serve the course to N learners from this machine (JupyterHub).")
    parser.add_argument("--users", type=int, default=4, help="learners, named learner1 ... learnerN")
    parser.add_argument("--port", type=int, default=8000, help="the port learners open in their browser")
    parser.add_argument("--ip", default="0.0.0.0", help="the address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--hub-port", type=int, default=8081, help="the hub's own port (on 127.0.0.1)")
    parser.add_argument("--proxy-api-port", type=int, default=8001, help="the proxy's API port (on 127.0.0.1)")
    parser.add_argument("--state-dir", default=str(ROOT / "build" / "hub"), help="config, database, homes")
    parser.add_argument("--course", default=str(RELEASE), help="the student release to serve (make student)")
    parser.add_argument("--no-sandbox", action="store_true", help="run the learners' servers without the sandbox "
                        "(a machine without bubblewrap): their code can then read the checkout, solutions included")
    args = parser.parse_args(argv)
    from .sandbox import available

    why = None if args.no_sandbox else available()
    if why:
        parser.error(f"the learners' sandbox cannot run here: {why}. Or pass --no-sandbox (HUB_ARGS=--no-sandbox), "
                     "knowing that a learner's code can then read labs/solutions by its path.")
    users = [f"learner{i}" for i in range(1, args.users + 1)]
    os.environ.setdefault("HUB_PASSWORD", secrets.token_urlsafe(9))
    if len(os.environ["HUB_PASSWORD"]) < 8:
        parser.error(f"HUB_PASSWORD has {len(os.environ['HUB_PASSWORD'])} characters: choose 8 or more")
    config = write_config(args.state_dir, users=users, port=args.port, ip=args.ip, hub_port=args.hub_port,
                          proxy_api_port=args.proxy_api_port, course=args.course, sandboxed=not args.no_sandbox)
    for seat in deal_seats(users):
        print(f"[hub] {seat.describe()}")
    host = "localhost" if args.ip in ("127.0.0.1", "localhost") else "<this machine's address>"
    print(f"[hub] learners open http://{host}:{args.port}/ and log in as learner1 ... learner{args.users}, "
          f"password {os.environ['HUB_PASSWORD']} (set HUB_PASSWORD to choose it); Ctrl-C stops the hub", flush=True)
    os.execv(str(BIN / "jupyterhub"), [str(BIN / "jupyterhub"), "-f", str(config)])


if __name__ == "__main__":
    main()
