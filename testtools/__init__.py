"""The `test.*` tools of API.md: their functions and the ledgers they keep (how often an effect ran,
how often a flaky call was tried). Installed only with OZ0_TEST_TOOLS=1 (tests, `./oz0 up --demo`),
so a real install has neither the tools nor their tables."""
