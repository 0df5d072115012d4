"""`python -m services.watcher` / `respawn-watcher`."""

from services.watcher.service import run


def main() -> None:
    run()


if __name__ == "__main__":
    main()
