"""The rank fixtures as the pytest process sees them, and `@rank_fixture`.

pytest resolves every fixture of a test in its own process before the test runs. For a
ranked test, the rank's own fixtures (`rank`, `device`, `rank_tmp_path`, `init_method`) and
every `@rank_fixture` have no value there: pytest gets a stand-in (`InRank`, `FixtureRef`),
and each rank builds the real value itself (harness/pytest_plugin/in_rank.py). `world_size`
is the same number everywhere. A stand-in used in the pytest process (a plain fixture that
asks for `rank`) raises one line saying where the value lives; asked for by a test that is
not ranked, these fixtures are an error naming the marker.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, Dict, Optional, Tuple, TypeVar, Union, overload

import pytest

from harness.pytest_plugin.call import IN_RANK_BUILTINS, RANK_SCOPES, FixtureRef, import_module
from harness.pytest_plugin.marker import Ranks

RANKS = pytest.StashKey[Ranks]()  # a ranked test item's request (set at collection)
SIZE_PARAM = "world_size"  # the argument a list of world sizes parametrizes

F = TypeVar("F", bound=Callable[..., Any])
_FUNCTIONS: Dict[Tuple[str, str], Callable[..., Any]] = {}


class InRank:
    """A rank's own fixture as the pytest process holds it: it has a value only in a rank."""

    def __init__(self, name: str, base: Optional[str] = None) -> None:
        self.fixture_name = name
        self.base = base  # rank_tmp_path: the folder each rank makes its own in

    def _refuse(self, *args: Any) -> Any:
        raise RuntimeError(
            f"fixture {self.fixture_name!r} has a value only inside the ranks of a "
            "@pytest.mark.ranks test: ask for it from the test or from a @rank_fixture, not "
            "from a fixture of the pytest process"
        )

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return self._refuse()

    __index__ = __int__ = __float__ = __fspath__ = __add__ = __radd__ = __mul__ = _refuse
    __truediv__ = __rtruediv__ = __sub__ = __rsub__ = __iter__ = __getitem__ = _refuse

    def __repr__(self) -> str:
        return f"<{self.fixture_name}: inside the ranks>"


def _ranked(request: pytest.FixtureRequest, name: str) -> Ranks:
    ranks = request.node.stash.get(RANKS, None)
    if ranks is None:
        pytest.fail(
            f"fixture {name!r} is for multi-rank tests: mark the test @pytest.mark.ranks(N) "
            "(or make it a method of a harness.DistributedTest class)", pytrace=False,
        )
    return ranks


@pytest.fixture
def rank(request: pytest.FixtureRequest) -> Any:
    """This rank's number, 0 to world_size - 1."""
    _ranked(request, "rank")
    return InRank("rank")


@pytest.fixture
def world_size(request: pytest.FixtureRequest) -> int:
    """How many ranks run the test (a listed size parametrizes this fixture)."""
    return _ranked(request, "world_size").sizes[0]


@pytest.fixture
def device(request: pytest.FixtureRequest) -> Any:
    """This rank's torch.device: its own accelerator, or the CPU."""
    _ranked(request, "device")
    return InRank("device")


@pytest.fixture
def rank_tmp_path(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    """A folder of this rank's own (tmp_path is the one every rank shares)."""
    _ranked(request, "rank_tmp_path")
    return InRank("rank_tmp_path", str(tmp_path_factory.mktemp("ranks", numbered=True)))


@pytest.fixture
def init_method(request: pytest.FixtureRequest) -> Any:
    """The test's rendezvous URL, for a test marked init=False that makes its own group."""
    _ranked(request, "init_method")
    return InRank("init_method")


@overload
def rank_fixture(function: F) -> F: ...


@overload
def rank_fixture(
    *, scope: str = "function", name: Optional[str] = None, autouse: bool = False
) -> Callable[[F], F]: ...


def rank_fixture(
    function: Optional[F] = None, *, scope: str = "function", name: Optional[str] = None,
    autouse: bool = False,
) -> Union[F, Callable[[F], F]]:
    """A fixture built in every rank of a ranked test, torn down there.

    It may ask for the rank's fixtures (`rank`, `device`, ...), other rank fixtures and any
    fixture of the pytest process (sent by value). `scope="ranks"` keeps it as long as a
    shared set of ranks lives (`mode="shared"`); elsewhere it is built for each test. A
    generator's code after `yield` runs in the rank when the test (or the set) ends.
    `autouse=True`: built in the ranks of every ranked test it is visible to (pytest's rule:
    its conftest, module or class), before the test's own fixtures; a test without ranks
    never gets it (where a framework's per-rank set-up goes: DeepSpeed's init_distributed).
    """
    if scope not in RANK_SCOPES:
        raise ValueError(
            f"@rank_fixture: unknown scope {scope!r} (known: {', '.join(RANK_SCOPES)})"
        )

    def decorate(fn: F) -> F:
        fixture_name = name or fn.__name__
        if "<locals>" in fn.__qualname__:
            raise ValueError(
                f"@rank_fixture {fixture_name!r} is defined inside a function: ranks find it "
                "by module and name, so define it at module level (or in a conftest.py)"
            )
        argnames = tuple(inspect.signature(fn).parameters)
        function: Callable[..., Any] = fn
        if "." in fn.__qualname__ and argnames[:1] == ("self",):  # a fixture method of a class:
            argnames, function = argnames[1:], functools.partial(fn, None)  # no instance there
        _FUNCTIONS[(fn.__module__, fixture_name)] = function
        ref = FixtureRef(fn.__module__, fixture_name, scope, argnames, fn.__code__.co_filename)

        if autouse:  # `_bound`: the test class's instance, where pytest binds it as a method
            def autouse_in_pytest_process(*_bound: Any, request: pytest.FixtureRequest) -> Any:
                return _autouse_in_pytest_process(ref, request)

            return pytest.fixture(name=fixture_name, autouse=True)(  # type: ignore[return-value]
                autouse_in_pytest_process
            )

        @functools.wraps(fn)
        def in_pytest_process(*args: Any, **kwargs: Any) -> FixtureRef:
            return ref

        return pytest.fixture(name=fixture_name)(in_pytest_process)  # type: ignore[return-value]

    return decorate if function is None else decorate(function)


def _autouse_in_pytest_process(ref: FixtureRef, request: pytest.FixtureRequest) -> Any:
    """An autouse rank fixture in the pytest process: nothing for a test without ranks (whose
    `rank` would be an error); for a ranked one, its stand-in with the fixtures it asks for
    resolved here, as pytest resolves a plain rank fixture's (the builtins made in the rank
    aside)."""
    if request.node.stash.get(RANKS, None) is None:
        return None
    resolved: Dict[str, Any] = {}
    todo = list(ref.argnames)
    while todo:  # what it asks for, and what the rank fixtures it asks for ask for
        name = todo.pop(0)
        if name in resolved or name in IN_RANK_BUILTINS or name == "request":
            continue
        resolved[name] = value = request.getfixturevalue(name)
        if isinstance(value, FixtureRef):
            todo.extend(value.argnames)
    return dataclasses.replace(ref, resolved=tuple(resolved.items()))


def rank_fixture_function(module: str, name: str, path: Optional[str] = None) -> Callable[..., Any]:
    """In a rank: the function of rank fixture `name`, defined in `module` (file `path`)."""
    import_module(module, path)
    try:
        return _FUNCTIONS[(module, name)]
    except KeyError:
        raise LookupError(f"rank fixture {name!r} not found in module {module}") from None
