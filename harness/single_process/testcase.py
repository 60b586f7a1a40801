"""The single-process base, as upstream's common_utils.TestCase: assertEqual, seeding, and
the process state each test must leave as it found it.

Every harness base class derives from `TestCase`, so rank processes and rank threads compare values
the same way a plain unit test does, and the way upstream's TestCase does (its keywords, tolerances,
`precision`/`rel_tol`, verdicts and messages: harness/single_process/comparison.py; differential
tests in tests/test_testcase.py hold them to upstream's). Around each test, as upstream: the random
generators are seeded, sparse tensors check their invariants, grad mode is restored, and a
torch-function mode left behind (`torch.set_default_device` pushes one) fails the test and is
removed. `setUp` also honours accelerator requirements declared on the test class
(harness/requirements/decorators.py).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import re
import subprocess
import sys
import unittest
import warnings
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple, Type, Union

import expecttest
import torch

from harness import settings
from harness.compat import torch_function as compat_torch_function
from harness.compat import unittest_internals
from harness.requirements.decorators import check_case_requirements
from harness.single_process.comparison import mismatch
from harness.single_process.subtests import run_subtests

# unittest and pytest hide frames of modules that define these (as unittest hides its own):
# a failure points at the test's line, not at assertEqual or the harness's method routing.
__unittest = True
__tracebackhide__ = True

SEED_ENV = "HARNESS_SEED"
DEFAULT_SEED = 1234
# Upstream's `common_utils.SEED`, module state a client may set (`common_utils.SEED = 99` on a
# file migrated to `import harness as common_utils` reaches here: harness/__init__.py). As
# upstream's, it reads 1234 until set, and each test's set-up seeds from its value then, in
# every rank too (ranks import the test module, so its module-level assignment runs there).
SEED: Optional[int] = DEFAULT_SEED


def current_seed() -> int:
    """The seed every test starts from: HARNESS_SEED (set by `--seed N`) when set (as the
    `--seed` of older upstream versions won; the installed one has none); else `SEED` (a
    client may set it: `harness.SEED = 99`); else (SEED set to None) 1234."""
    seed = settings.env_int(SEED_ENV)
    if seed is not None:
        return seed
    return DEFAULT_SEED if SEED is None else int(SEED)


def seed_everything(seed: int) -> None:
    """Seed torch, random and numpy (when installed) so every test starts identically.

    Without an accelerator only the CPU generator is seeded: `torch.manual_seed` would also
    queue a lazy seed for each accelerator type torch knows, recording a stack trace for each
    (a fifth of a millisecond or more, every test, in every rank).
    """
    if torch.accelerator.current_accelerator() is None:
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed % 2**32)


Message = Union[str, Callable[[str], str], None]


class _TestName(str):
    """A test's method name that can also be called: upstream's multi-process base has
    `_current_test_name()` as a method, its multi-thread base as a property."""

    def __call__(self) -> str:
        return str(self)


def _expect_file(case: unittest.TestCase, subname: Optional[str]) -> Tuple[str, str]:
    """(path, label) of the recorded output of `case`: `expect/<Class>.<test>[-subname].expect`
    next to the file that defines the test class, as upstream's assertExpected."""
    module = type(case).__module__
    test_id = case.id()
    label = test_id[len(module) + 1:] if test_id.startswith(module + ".") else test_id
    folder = os.path.dirname(os.path.realpath(str(sys.modules[module].__file__)))
    name = label + (f"-{subname}" if subname else "")
    return os.path.join(folder, "expect", f"{name}.expect"), label


@unittest_internals.show_every_diff  # as upstream: multi-line strings always get a diff
class ProcessState:
    """The process state a test must leave as it found it, as upstream's TestCase keeps it:
    taken when the test starts (which switches the sparse-tensor invariant checks on for the
    test), given back by `restore`. Also what the pytest plugin keeps around a marked
    function's thread ranks, which share this process."""

    def __init__(self) -> None:
        self._sparse_checks_were_on = torch.sparse.check_sparse_tensor_invariants.is_enabled()
        torch.sparse.check_sparse_tensor_invariants.enable()
        self._grad_was_enabled = torch.is_grad_enabled()
        self._modes_before = compat_torch_function.mode_stack_depth()
        self._dispatch_before = compat_torch_function.dispatch_state()

    def restore(self) -> Optional[str]:
        """Give the state back; what the test leaked that fails it (a torch-function mode or
        dispatch state, undone here), else None."""
        if self._sparse_checks_were_on:
            torch.sparse.check_sparse_tensor_invariants.enable()
        else:
            torch.sparse.check_sparse_tensor_invariants.disable()
        torch.set_grad_enabled(self._grad_was_enabled)
        depth = compat_torch_function.mode_stack_depth()
        if depth != self._modes_before:
            compat_torch_function.pop_modes(max(0, depth - self._modes_before))
            return ("torch function mode stack was leaked: "
                    f"length changed from {self._modes_before} to {depth}")
        state = compat_torch_function.dispatch_state()
        if state != self._dispatch_before:
            compat_torch_function.set_dispatch_state(self._dispatch_before)
            return (f"torch function state was leaked: changed from {self._dispatch_before} "
                    f"to {state}")
        return None


class TestCase(expecttest.TestCase):
    """expecttest's TestCase with upstream's assertEqual, seeding and per-test state checks."""

    # Lower bounds of assertEqual's absolute / relative tolerance (upstream's precisionOverride
    # and toleranceOverride set them); read through `precision` / `rel_tol`.
    _precision: float = 0
    _rel_tol: float = 0
    maxDiff = None  # noqa: N815 - unittest's name

    def __init__(
        self, method_name: str = "runTest", methodName: str = "runTest"  # noqa: N803 - unittest's
    ) -> None:
        # Both spellings, as upstream: unittest's `methodName` wins when given.
        super().__init__(methodName if methodName != "runTest" else method_name)

    @property
    def precision(self) -> float:
        """The smallest absolute tolerance assertEqual uses (0: the dtype's default)."""
        return self._precision

    @precision.setter
    def precision(self, value: float) -> None:
        self._precision = value

    @property
    def rel_tol(self) -> float:
        """The smallest relative tolerance assertEqual uses (0: the dtype's default)."""
        return self._rel_tol

    @rel_tol.setter
    def rel_tol(self, value: float) -> None:
        self._rel_tol = value

    @property
    def _current_test_name(self) -> str:
        """The running test's method name; usable as upstream's method and as its property."""
        return _TestName(self.id().split(".")[-1])

    def setUp(self) -> None:
        super().setUp()
        check_case_requirements(self)  # class-level requirements; methods check their own too
        seed_everything(current_seed())
        self._process_state = ProcessState()  # what tearDown restores or checks, as upstream's

    def tearDown(self) -> None:
        """Give back the process state the test changed; a torch-function mode or dispatch
        state left behind fails the test (after being undone), as upstream."""
        state = getattr(self, "_process_state", None)  # a subclass's setUp may not call ours
        leaked = state.restore() if state is not None else None
        if leaked is not None:
            raise self.failureException(leaked)
        super().tearDown()

    def _comparison_failure(self, msg: Message, reason: str) -> AssertionError:
        """Upstream's failure text: the generated reason, then a str `msg` on its own line
        (only `msg` where longMessage is off); a callable `msg` builds it from the reason."""
        if callable(msg):
            return self.failureException(msg(reason))
        if isinstance(msg, str):
            return self.failureException(f"{reason}\n{msg}" if self.longMessage else msg)
        return self.failureException(reason)

    def assertEqual(  # noqa: N802 - unittest's naming
        self,
        first: Any,
        second: Any,
        msg: Message = None,
        *,
        atol: Optional[float] = None,
        rtol: Optional[float] = None,
        equal_nan: bool = True,
        exact_dtype: bool = True,
        exact_device: bool = False,
        exact_layout: bool = False,
        exact_stride: bool = False,
        exact_is_coalesced: bool = False,
    ) -> None:
        """Upstream's assertEqual: tensors by value (dtype tolerances, at least `precision` /
        `rel_tol`), containers elementwise, upstream's messages.

        `msg` (positional or keyword) is added to the failure, or, when callable, builds it
        from the generated message.
        """
        reason = mismatch(
            first, second, atol=atol, rtol=rtol, equal_nan=equal_nan, exact_dtype=exact_dtype,
            exact_device=exact_device, exact_layout=exact_layout, exact_stride=exact_stride,
            exact_is_coalesced=exact_is_coalesced, atol_floor=self.precision,
            rtol_floor=self.rel_tol,
        )
        if reason is not None:
            raise self._comparison_failure(msg, reason)

    def assertNotEqual(  # noqa: N802 - unittest's naming
        self,
        first: Any,
        second: Any,
        msg: Message = None,
        *,
        atol: Optional[float] = None,
        rtol: Optional[float] = None,
        **options: Any,
    ) -> None:
        """The negation of assertEqual, with the same comparison rules and keywords; fails
        with upstream's text, `AssertionError not raised`."""
        reason = mismatch(
            first, second, atol=atol, rtol=rtol, atol_floor=self.precision,
            rtol_floor=self.rel_tol, **options,
        )
        if reason is None:
            shown = msg if isinstance(msg, str) else None
            raise self.failureException(
                unittest_internals.format_message(self, shown, "AssertionError not raised")
            )

    def assertEqualIgnoreType(self, *args: Any, **kwargs: Any) -> None:  # noqa: N802
        """assertEqual without the dtype check (upstream's name)."""
        self.assertEqual(*args, exact_dtype=False, **kwargs)

    def assertObjectIn(self, obj: Any, iterable: Any) -> None:  # noqa: N802 - upstream's
        """Fail unless `obj` itself (not an equal object) is in `iterable`."""
        if not any(item is obj for item in iterable):
            raise self.failureException("object not found in iterable")

    def assertLogs(self, logger: Any = None, level: Any = None) -> Any:  # noqa: N802
        """unittest's assertLogs, on the `torch` logger by default (upstream's)."""
        return super().assertLogs(logging.getLogger("torch") if logger is None else logger, level)

    def assertNoLogs(self, logger: Any = None, level: Any = None) -> Any:  # noqa: N802
        """unittest's assertNoLogs, on the `torch` logger by default (upstream's)."""
        return super().assertNoLogs(
            logging.getLogger("torch") if logger is None else logger, level
        )

    def assertExpected(self, s: str, subname: Optional[str] = None) -> None:  # noqa: N802
        """`s` must equal the recorded `expect/<Class>.<test>[-subname].expect` beside the test
        file; with `--accept` (or EXPECTTEST_ACCEPT=1) it is recorded instead."""
        if not isinstance(s, str):
            raise TypeError("assertExpected is strings only")
        path, label = _expect_file(self, subname)
        shown = f"{label}{f' ({subname})' if subname else ''}"
        try:
            with open(path) as f:
                expected: Optional[str] = f.read()
        except OSError as error:
            if error.errno != errno.ENOENT:
                raise
            expected = None
        if expecttest.ACCEPT:
            if expected != s:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(s)
                print(f"Accepting {'output' if expected is None else 'updated output'} "
                      f"for {shown}:\n\n{s}")
            return
        if expected is None:
            raise RuntimeError(
                f"I got this output for {shown}:\n\n{s}\n\nNo expect file exists; to accept "
                f"the current output, run:\npython {sys.argv[0]} {label} --accept"
            )
        self.assertMultiLineEqual(expected, s)

    def assertExpectedRaises(  # noqa: N802 - upstream's name
        self, exc_type: Type[BaseException], callable: Callable[..., Any],  # noqa: A002
        *args: Any, **kwargs: Any,
    ) -> None:
        """`callable(*args, **kwargs)` must raise `exc_type`, whose message must match the
        recorded one (assertExpected; a `subname=` keyword is taken for it)."""
        subname = kwargs.pop("subname", None)
        try:
            callable(*args, **kwargs)
        except exc_type as error:
            self.assertExpected(str(error), subname)
            return
        self.fail(msg="Did not raise when expected to")

    @contextlib.contextmanager
    def assertWarnsOnceRegex(  # noqa: N802 - upstream's name
        self, category: Type[Warning], regex: str = ""
    ) -> Iterator[None]:
        """The block must warn `category` with a message matching `regex`, counting warnings
        torch would show only once."""
        previous = torch.is_warn_always_enabled()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.set_warn_always(True)
            try:
                yield
            finally:
                torch.set_warn_always(previous)
        if not caught:
            self.fail("no warning caught")
        matching = [w for w in caught if type(w.message) is category]
        shown = [str(w.message) for w in caught]
        self.assertTrue(matching, f"no {category.__name__} among {shown}")
        pattern = re.compile(regex)
        self.assertTrue(
            any(pattern.match(str(w.message)) for w in matching),
            f"{pattern}, {[str(w.message) for w in matching]}",
        )

    def genSparseTensor(  # noqa: N802 - upstream's name
        self, size: Sequence[int], sparse_dim: int, nnz: int, is_uncoalesced: bool,
        device: Any, dtype: torch.dtype,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A random sparse COO tensor of `size` with `nnz` entries in its `sparse_dim` sparse
        dims and values in [-1, 1), and its indices and values. Uncoalesced: half the entries
        repeated (so some indices occur twice)."""
        if nnz and not all(size[d] > 0 for d in range(sparse_dim)):
            raise AssertionError(
                f"invalid arguments: size={size}, sparse_dim={sparse_dim}, nnz={nnz}"
            )
        values = torch.testing.make_tensor(
            [nnz, *size[sparse_dim:]], device=device, dtype=dtype, low=-1, high=1
        )
        extents = torch.tensor(list(size[:sparse_dim]), device=device, dtype=torch.float32)
        indices = (torch.rand(sparse_dim, nnz, device=device) * extents[:, None]).long()
        if is_uncoalesced:
            indices = torch.cat([indices[:, : nnz // 2], indices[:, : (nnz + 1) // 2]], 1)
        tensor = torch.sparse_coo_tensor(indices, values, torch.Size(size), dtype=dtype,
                                         device=device)
        if is_uncoalesced:
            return tensor, indices.clone(), values.clone()
        tensor = tensor.coalesce()
        return tensor, tensor.indices().clone(), tensor.values().clone()

    def assertNotWarn(self, callable: Callable[[], Any], msg: str = "") -> None:  # noqa: N802, A002
        """Fail if `callable()` warns, counting warnings torch would show only once."""
        previous = torch.is_warn_always_enabled()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.set_warn_always(True)
            try:
                callable()
            finally:
                torch.set_warn_always(previous)
        if caught:
            shown = "; ".join(f"{w.category.__name__}: {w.message}" for w in caught)
            raise self.failureException(
                unittest_internals.format_message(self, msg or None, f"warned: {shown}")
            )

    def _attempt_load_from_subprocess(
        self, file: Any, import_string: str, expected_failure_message: Optional[str] = None
    ) -> None:
        """`torch.load(file, weights_only=True)` in a fresh interpreter after `import_string`.

        Checks that a checkpoint loads without the test process's imports. With
        `expected_failure_message`, the load must fail with a RuntimeError containing it.
        """
        script = f"import torch;{import_string}torch.load(r'{file}', weights_only=True)"
        expectation = (
            self.assertRaisesRegex(RuntimeError, re.escape(expected_failure_message))
            if expected_failure_message else contextlib.nullcontext()
        )
        with expectation:
            try:
                subprocess.check_output(
                    [sys.executable, "-c", script], stderr=subprocess.STDOUT,
                    cwd=os.path.dirname(os.path.abspath(str(file))),
                )
            except subprocess.CalledProcessError as error:
                raise RuntimeError(error.output.decode("utf-8", "replace")) from None

    def run_subtests(
        self, grid: Dict[str, Sequence[Any]], fn: Callable, *args: Any, **kwargs: Any
    ) -> None:
        """Run `fn` for every point of `grid`, each point a subTest
        (harness/single_process/subtests.py)."""
        run_subtests(self, grid, fn, *args, **kwargs)

