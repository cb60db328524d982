"""Other frameworks (lesson 13, parts 13a and 13b, optional ``[frameworks]`` extra): ``tf_toynet`` (the course model
in TensorFlow and one data-parallel step for any ``tf.distribute`` strategy; imports TensorFlow only when called) and
``reference`` (the torch reference both parts hold TensorFlow to, and the two tolerances; torch only).
"""
