"""`claw-stream report`: what each version learned, read from Postgres (`reading`), put
together (`learning`, pure) and shown as a table, a PNG and an HTML page (`render`)."""
