"""`python -m gbdoctor` is the same as the `gbdoctor` console script."""

from gbdoctor.cli import main

if __name__ == "__main__":
    main()
