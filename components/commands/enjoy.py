"""placeholder"""


def register(subparsers):  # noqa: D103
    pass
