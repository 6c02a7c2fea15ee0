"""`itlaudit smoke`: a release go/no-go from a fixed suite of small scenarios.

Suite loading and validation (`suite`), pure check evaluation (`checks`), output writers (`output`,
`junit`) and the composition that starts servers and runs scenarios through `compare.run_compare`
(`runner`). Data flows one way: suite → runs (run folders) → figures → check results → files.
"""
