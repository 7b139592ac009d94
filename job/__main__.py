from job.cli import console

console()
