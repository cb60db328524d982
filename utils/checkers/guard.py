"""The guard of forbidden calls: the key targets tripped in place, so that no alias reaches them unseen.

The watcher (``utils.checkers.watch``) is a profile hook: it sees a call into a whole module, but an answer can
step around it. A builtin called from C emits no event, so ``functools.partial(sys.setprofile, None)()`` switches
the hook off unseen (and puts it back afterwards); a pool thread started before the check never had the hook; a
``code.replace()`` copy of a target has another code object. So, beside the hook, while the learner's code runs:

- each forbidden Python *function object* has its ``__code__`` swapped for a stub (generated with the same free
  variables as the function, the one constraint of assigning ``__code__``). Every alias of the function runs the
  stub: a name imported earlier, a ``partial``, a thread target, a pool task, on any thread, hook or no hook. The
  stub records the call in the ``Guard`` and raises ``Refused``, a private ``BaseException``: ``except Exception``
  does not swallow it, and whatever the answer catches, the checker names the mistake from the record;
- ``operators``: an aten operator (``aten::_scaled_dot_product_flash_attention_for_cpu_backward``) gets a kernel of
  its own on the CPU and CUDA dispatch keys (``torch.library``), which records the call and raises: whatever path
  reaches the operator (``torch.ops``, an ``OpOverload`` kept in a variable, ``torch._C._jit_get_operation``, a
  thread) goes through the dispatcher, and meets it. Only aten operators: a higher-order operator (flex attention's)
  runs Python functions, which ``functions`` trips. The kernels are the whole process's while the guard is on, so
  nothing else may use those operators meanwhile (the course's code under a guard does not);
- a builtin has no ``__code__`` (``F.scaled_dot_product_attention``): it is replaced by a recording wrapper on the
  modules torch exposes it from, for the duration. A reference taken *before* the call (``sdpa = F.scaled_...`` at a
  cell's top level) still reaches the builtin: only the hook sees that call (a ``c_call``), and not when it is made
  through a ``partial`` or with the hook switched off. Nor does anything see the operator underneath,
  ``torch.ops.aten.scaled_dot_product_attention`` (called through ``OpOverload.__call__``, neither a builtin on those
  modules nor a ``c_call``), unless it is one of ``operators``.

Every ``__code__`` and attribute is put back in a ``finally``, whatever the answer raised. What still passes the
guard: a copy of a target's code made *before* the call (``types.FunctionType(f.__code__.replace(), ...)``: another
function object; the hook matches it by ``code_key``, unless the hook is switched off too), a reimplementation, and
an answer that edits the checker's own modules (``Guard``, this registry) or reaches the guard's own objects (its
``torch.library.Library``, found through the garbage collector): no Python checker can stop that.
"""

import itertools
import threading
import types

__all__ = ["Refused", "Guard", "module_functions", "code_key"]

_TRIPPED = {}  # key -> (guard, label) while a guard is on
_STUBS = {}  # function -> (key, stub code): generated once per function
_KEYS = itertools.count()


class Refused(BaseException):
    """Raised by a tripped target once its call is recorded (a BaseException: ``except Exception`` lets it by)."""


def code_key(code):
    """What a copy of ``code`` keeps: its bytecode, constants and global names (``code.replace()`` or a rename makes a
    new code object, and a changed ``co_firstlineno`` or ``co_name`` an unequal one; the name is not part of the key
    since a rename is free)."""
    return code.co_code, code.co_consts, code.co_names


def module_functions(module):
    """The Python functions defined in ``module``: at its top level and in its classes (methods, static and class
    methods, properties' accessors)."""
    found = {}

    def add(obj):
        if isinstance(obj, types.FunctionType) and obj.__module__ == module.__name__:
            found[id(obj)] = obj

    for value in vars(module).values():
        add(value)
        if isinstance(value, type) and value.__module__ == module.__name__:
            for member in vars(value).values():
                member = getattr(member, "__func__", member)  # staticmethod, classmethod
                for part in ((member.fget, member.fset, member.fdel) if isinstance(member, property) else (member,)):
                    add(part)
    return list(found.values())


def _stub(fn):
    """(key, code): a stub for ``fn`` that hands the call to ``_tripped(key, ...)``, with ``fn``'s free variables."""
    if fn not in _STUBS:
        code, key, free = fn.__code__, next(_KEYS), fn.__code__.co_freevars
        source = ("def _outer():\n"
                  + (f"    {' = '.join(free)} = None\n" if free else "")
                  + "    def tripped(*args, **kwargs):\n"
                  + (f"        {', '.join(free)}\n" if free else "")  # read: free variables of the stub, as in fn
                  + f"        return __import__({__name__!r}, fromlist=['_'])._tripped({key}, args, kwargs)\n"
                  + "    return tripped\n")
        namespace = {}
        exec(compile(source, code.co_filename, "exec"), namespace)  # the file of fn: the hook sees the call as fn's
        stub = namespace["_outer"]().__code__.replace(co_name=code.co_name, co_qualname=code.co_qualname,
                                                       co_firstlineno=code.co_firstlineno)
        assert len(stub.co_freevars) == len(free), (fn, stub.co_freevars, free)
        _STUBS[fn] = key, stub
    return _STUBS[fn]


def _tripped(key, args, kwargs):
    """What a tripped target runs, whoever calls it: a record, then ``Refused``."""
    guard, label = _TRIPPED[key]
    guard.records.append(label)
    raise Refused(label)


class Guard:
    """While on (a context manager): ``functions``, (function, label) pairs, tripped in place; ``attributes``,
    (owner, name, label) triples, each replaced by a recording wrapper. ``records``: the labels of the calls made."""

    def __init__(self, functions=(), attributes=(), operators=()):
        self.functions, self.attributes, self.operators = list(functions), list(attributes), list(operators)
        self._library = None
        self.records, self._undo = [], []
        for fn, _ in self.functions:  # the stubs made now, before any hook watches
            _stub(fn)

    def __enter__(self):
        self._excepthook = threading.excepthook
        threading.excepthook = self._thread_refused  # a refusal on the answer's thread: recorded, not printed
        try:
            for fn, label in self.functions:
                if fn.__code__ is _stub(fn)[1]:
                    continue  # the same function twice (an alias in another module)
                key, stub = _stub(fn)
                _TRIPPED[key] = self, label
                self._undo.append((fn, "__code__", fn.__code__, key))
                fn.__code__ = stub
            for owner, name, label in self.attributes:
                key, value = next(_KEYS), getattr(owner, name)
                _TRIPPED[key] = self, label

                def wrapper(*args, _key=key, **kwargs):
                    return _tripped(_key, args, kwargs)

                self._undo.append((owner, name, value, key))
                setattr(owner, name, wrapper)
            self._refuse_operators()
        except BaseException:
            self._restore()
            threading.excepthook = self._excepthook
            raise
        return self

    def _refuse_operators(self):
        """Each of ``operators`` ((qualified name, label) pairs) refused on the CPU and CUDA dispatch keys."""
        if not self.operators:
            return
        import warnings

        import torch

        self._library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that a kernel is overridden: on purpose, for the call
            for name, label in self.operators:
                namespace, op = name.split("::")
                if namespace != "aten":
                    raise ValueError(f"{name}: Guard refuses aten operators only")

                def kernel(*args, _label=label, **kwargs):
                    self.records.append(_label)
                    raise Refused(_label)

                for dispatch_key in ("CPU", "CUDA"):
                    self._library.impl(op, kernel, dispatch_key)

    def _restore(self):
        if self._library is not None:
            self._library._destroy()  # the operators' own kernels back
            self._library = None
        while self._undo:
            owner, name, value, key = self._undo[-1]
            setattr(owner, name, value)  # first, then forget it: an interrupt in between leaves nothing tripped
            self._undo.pop()
            _TRIPPED.pop(key, None)

    def _thread_refused(self, args):
        if not issubclass(args.exc_type, Refused):
            self._excepthook(args)

    def __exit__(self, *exc):
        self._restore()
        threading.excepthook = self._excepthook
        return False
