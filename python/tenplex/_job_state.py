"""The state of a `tenplex.elastic.Job` that its parts read: declared once, for the
type checker, by the classes Job is made of (`elastic_commit.Commits`, the commits;
`member.MemberJob`, in-process membership). `Job.__init__` and `restore()` set them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._early_restore import EarlyRestore
    from .elastic_cluster import Coordinator
    from .elastic_policy import SuggestPolicy
    from .member import Member, Presize
    from .store import Store


class JobState:
    """Attributes only (no behaviour): what every part of a Job may read."""

    job: str
    policy: dict[int, str] | SuggestPolicy  # world size -> config, or a suggest: policy
    config: str  # this world's parallel config
    knobs: list[str]  # the Megatron-LM arguments the policy chose with the config
    commit_every: int
    async_commit: bool
    url: str  # this host's store daemon
    token: str
    request_timeout: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int
    hosts: list[str] | None  # every host's daemon, from restore() on
    cluster: dict[str, Any] | None  # the "cluster" record of the versions this job commits
    version: int | None  # the committed version this worker's state belongs to
    _coord: Coordinator | None  # rank 0: the job's coordinator, from restore() on
    _member: Member | None  # in-process membership; None under torchrun
    _presize: Presize | None
    _early: EarlyRestore | None  # rank 0 in membership mode: the restore started in rejoin()
    _pending: tuple[int, dict[str, Any], float, Any] | None  # an asynchronous commit (its AsyncCommit last)
    _pg: tuple[str, float]  # init_process_group's backend and timeout
    _term: bool
    _stopping: bool
    _first_step: bool

    if TYPE_CHECKING:

        def _log_event(self, rec: dict[str, Any]) -> None: ...

        def _local_store(self) -> Store: ...

        def _guarded_restore(self, urls: list[str]) -> dict[str, Any]: ...
