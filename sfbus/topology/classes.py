"""Actor classes named in a topology (``module:Class``), imported and checked."""

from __future__ import annotations

import sys

from sfbus.errors import TopologyError
from sfbus.topology.imports import ImportPathError, import_object


def import_actor_class(class_path: str) -> type:
    """Import ``"module:Class"`` and check it is an ``Actor``; raises an unlocated TopologyError."""
    try:
        obj = import_object(class_path)
    except ImportPathError as error:
        raise TopologyError(str(error)) from None
    # Looked up, not imported: a subclass of Actor has imported sfbus.actor already, and not
    # importing it keeps the topology below the actor in the kernel's layers (sfbus.actor's
    # context reaches the topology through the routing table; an import back would close a circle).
    base = getattr(sys.modules.get("sfbus.actor"), "Actor", None)
    if not (isinstance(obj, type) and base is not None and issubclass(obj, base)):
        raise TopologyError(f"'{class_path}' is not a subclass of sfbus.actor.Actor")
    return obj
