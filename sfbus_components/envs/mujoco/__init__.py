"""MuJoCo continuous control through gymnasium (`mujoco_<name>`; the `mujoco` extra)."""
