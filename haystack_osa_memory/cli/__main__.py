"""`python -m haystack_osa_memory.cli`."""

from haystack_osa_memory.cli.main import main

main()
