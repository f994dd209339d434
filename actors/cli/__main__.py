"""``python -m actors.cli``: the `claimd` command."""

from actors.cli.main import main

if __name__ == "__main__":
    main()
