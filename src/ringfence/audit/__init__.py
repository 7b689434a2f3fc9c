"""The tamper-evident audit log: hash-chained records (``chain``) sealed with Ed25519
(``signing``) and checked offline (``verify``). Import the submodules: this package itself
imports nothing, so the store can use ``chain`` without loading the signing library."""
