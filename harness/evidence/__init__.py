"""The evidence document as plain data: verdicts, claim results with typed
details, and the document's JSON form.  Nothing here runs a model or renders."""
