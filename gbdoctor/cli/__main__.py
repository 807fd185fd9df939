"""`python -m gbdoctor.cli` is the same as the `gbdoctor` console script (as `python -m gbdoctor`)."""

from gbdoctor.cli.root import main

if __name__ == "__main__":
    main()
