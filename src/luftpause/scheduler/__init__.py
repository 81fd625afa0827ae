"""The scheduler: a pure decision core and the service that hosts it."""
