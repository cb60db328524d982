"""The ipywidgets front ends, each around a lesson's own function: ``memory`` (lesson 03's ZeRO memory
calculator), ``pipeline`` (lesson 06's schedule explorer), ``planner`` (lesson 09's planner).
"""
