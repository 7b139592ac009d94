import sys

from job.cli import main

sys.exit(main(sys.argv[1:]))
