mod sys;
