"""(placeholder: filled in by its owner)"""


def register(subparsers) -> None:
    pass
