"""The course around the notebooks: the catalog of the labs, the student views, running notebooks, the
release bundle, grading a class, the reading site, and the GPU check."""
