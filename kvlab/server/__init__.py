"""llama-server and prompt models: slots and the RAM prompt cache, conversation replay, slot files,
sliding-window checkpoints, prompt layout, agent history. State and rules only: the lessons' runs live
in ``kvlab.lessons``, the captions of their events in ``kvlab.views.text``."""
