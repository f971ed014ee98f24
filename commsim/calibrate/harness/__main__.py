"""`python -m commsim.calibrate.harness CONFIG`: one rank started by launch_local."""

import sys

from commsim.calibrate.harness.launch import exit_now, main

if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
