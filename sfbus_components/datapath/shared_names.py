"""Setting names sfbus shares with Sample Factory 2.1.1 whose meaning differs here.

Every other name the two share means the same thing (docs/FROM_SAMPLE_FACTORY.md, "Shared names
that mean something else", holds the same list as a table). A topology that sets one of these,
in its ``settings``, an actor's ``params`` or a ``--set``, gets one ``note:`` line per name when it
is validated or started, so that a Sample Factory user is not surprised by a name they know.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

DIFFERENCES: dict[str, str] = {
    "batch_size": (
        "is the whole training batch in samples; Sample Factory's --batch_size is one minibatch "
        "(its --batch_size=B --num_batches_per_epoch=K is batch_size B*K here)"),
    "appo.num_batches_per_epoch": (
        "cuts batch_size into that many minibatches; in Sample Factory each minibatch holds "
        "--batch_size samples, so K of them make a K times larger batch"),
    "appo.max_policy_lag": (
        "counts batches trained (the version rises once a batch) and keeps a sample lagging "
        "exactly that much; Sample Factory counts SGD steps and keeps lags below it"),
    "appo.with_vtrace": (
        "is on by default here (off in Sample Factory) and works with appo.normalize_returns and "
        "any appo.recurrence, which Sample Factory refuses with V-trace"),
    "appo.shuffle_minibatches": (
        "deals whole trajectories into minibatches (on by default); Sample Factory shuffles "
        "recurrence-long pieces (off by default)"),
    "appo.num_epochs": (
        "always runs every epoch; Sample Factory stops a batch's epochs early once the policy "
        "loss changes by less than 1e-6"),
}
"""sfbus's setting path (``appo.`` for the learner's ``AppoConfig``) to how it differs."""


def shared_name_notes(document: Mapping[str, Any]) -> list[str]:
    """One note per setting of :data:`DIFFERENCES` that the merged topology ``document`` sets."""
    given: dict[str, Any] = {}
    settings = document.get("settings")
    if isinstance(settings, Mapping):
        given.update(_leaves(settings))
    processes = document.get("processes")
    for process in processes.values() if isinstance(processes, Mapping) else ():
        actors = process.get("actors") if isinstance(process, Mapping) else None
        for actor in actors.values() if isinstance(actors, Mapping) else ():
            params = actor.get("params") if isinstance(actor, Mapping) else None
            if isinstance(params, Mapping):
                for path, value in _leaves(params):
                    given.setdefault(path, value)
    return [f"{path} {_shown(given[path])} {difference} (docs/FROM_SAMPLE_FACTORY.md)"
            for path, difference in DIFFERENCES.items() if path in given]


def _leaves(mapping: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted path, value)`` of every key of ``mapping``, nested mappings walked into."""
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        yield path, value
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{path}.")


def _shown(value: Any) -> str:
    """A setting's value as YAML writes a scalar (``true``, not Python's ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)
