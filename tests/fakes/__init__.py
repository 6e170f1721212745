"""Stand-ins for the platforms, speaking their real wire protocols on loopback."""
