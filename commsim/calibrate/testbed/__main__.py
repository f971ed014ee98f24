"""`python -m commsim.calibrate.testbed sink|source ...`: a stream end in a namespace."""

import sys

from commsim.calibrate.testbed.probe import probe

if __name__ == "__main__":
    probe(sys.argv[1:])
