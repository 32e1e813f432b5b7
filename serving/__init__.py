"""HTTP serving: the FastAPI app factory, routes and the serving benchmark."""
