"""`python -m services.lifecycle` / `respawn-lifecycle`."""

from services.lifecycle.service import run


def main() -> None:
    run()


if __name__ == "__main__":
    main()
