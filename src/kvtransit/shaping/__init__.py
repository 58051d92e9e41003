"""Link specs -> tc/ip argv lists; apply, verify, clean up exactly what was made. Imports nothing from kvtransit."""
