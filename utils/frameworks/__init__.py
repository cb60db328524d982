"""Other frameworks (lesson 13, optional ``[frameworks]`` extra): ``tf_toynet`` (the course model in TensorFlow
and one data-parallel step for any ``tf.distribute`` strategy; imports TensorFlow only when called).
"""
