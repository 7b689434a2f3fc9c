"""The native API's routes, one module per resource."""
