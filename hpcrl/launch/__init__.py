"""The launch layer, above the workers (docs/architecture.md): `run` is what every rank of
`hpcrl run` executes (start-up checks, then the poll loop), `wiring` the topology (every
connection between workers made in one place). MPI is reached only through hpcrl.runtime."""
