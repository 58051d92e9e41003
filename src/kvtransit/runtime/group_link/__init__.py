"""The links between a group's ranks (TP/EP groups, ring attention, selection's and weight streaming's roles): dialling
and accepting peers, frames held to a modelled link, answers, the followers' order loop."""
