"""EnvPool's batched C++ envs (`envpool:<task>`; the `envpool` extra)."""
