"""Redis Streams transport: connections, the server process, commits and claims."""
