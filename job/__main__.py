import gc

# The imports make tens of thousands of objects that live as long as the process: the cyclic
# collector is paused while they are made (console() freezes them and resumes it).
gc.disable()
from job.cli import console  # noqa: E402

console()
